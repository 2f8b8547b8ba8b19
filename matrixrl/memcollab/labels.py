"""Task labels: each problem's (category, subcategory), from a fixed taxonomy per family.

docs/memcollab.md, "Labels".
"""

from __future__ import annotations

import re

from matrixrl.memcollab.data import Label

OTHER = Label("other", "other")
MAX_LABEL_CHARS = 4000  # a label is a few words; longer replies are read this far

TAXONOMY: dict[str, dict[str, tuple[str, ...]]] = {
    "math": {
        "arithmetic": (
            "basic operations",
            "fractions & decimals",
            "percentages",
            "ratios & rates",
            "exponents & roots",
        ),
        "algebra": (
            "linear equations",
            "systems of equations",
            "quadratics & polynomials",
            "inequalities",
            "functions",
            "sequences & series",
        ),
        "geometry": ("angles & triangles", "area & perimeter", "circles", "coordinate geometry", "solids & volume"),
        "number theory": ("divisibility & primes", "gcd & lcm", "modular arithmetic", "digits & bases"),
        "counting & probability": ("counting", "probability", "statistics"),
        "precalculus": ("trigonometry", "complex numbers", "vectors & matrices", "logarithms & exponentials"),
        "word problems": ("money", "time & distance", "ages", "quantities & units"),
    },
    "code": {
        "strings": ("transformation", "searching & matching", "parsing & formatting"),
        "lists": ("filtering & mapping", "sorting & ordering", "searching", "aggregation"),
        "math": ("arithmetic", "number theory", "sequences", "geometry"),
        "data structures": ("dicts & sets", "stacks & queues", "trees & graphs"),
        "algorithms": ("recursion", "dynamic programming", "greedy", "simulation"),
    },
}


def options(family: str) -> tuple[Label, ...]:
    """The labels a ``family`` problem can get, in the labeller's numbering (1 is the first)."""
    if family not in TAXONOMY:
        raise ValueError(f"task labels cover families {', '.join(TAXONOMY)}, not {family!r}")
    return tuple(Label(c, s) for c, subs in TAXONOMY[family].items() for s in subs) + (OTHER,)


def labeller_messages(question: str, family: str) -> tuple[str, str]:
    """The labeller's (system, user) messages: pick one numbered option for ``question``."""
    listed = "\n".join(f"{i}. {label}" for i, label in enumerate(options(family), 1))
    noun = "math" if family == "math" else "programming"
    system = (
        f"You classify {noun} problems by topic. Reply with the number of the one option that fits the "
        "problem best, then its name, and nothing else."
    )
    return system, f"Problem:\n{question}\n\nOptions:\n{listed}"


def _normal(text: str) -> str:
    text = re.sub(r"[*`_]", "", text.casefold().replace("&", " and "))
    return re.sub(r"\s*/\s*", "/", " ".join(text.split()))


def parse_label(text: str, family: str) -> Label:
    """The label a labeller's reply names (see the module's rules); ``other / other`` when none."""
    labels = options(family)
    text = text if isinstance(text, str) else ""
    end = text.rfind("</think>")
    text = _normal((text[end + len("</think>") :] if end != -1 else text)[:MAX_LABEL_CHARS])
    found = []
    for label in labels:
        match = re.search(rf"(?<!\w){re.escape(_normal(str(label)))}(?!\w)", text)
        if match:
            found.append((match.start(), -len(match.group()), label))
    if found:
        return min(found, key=lambda f: f[:2])[2]
    for number in re.findall(r"(?<![\w.])\d{1,4}(?!\w|\.\d)", text):
        if 1 <= int(number) <= len(labels):
            return labels[int(number) - 1]
    return OTHER
