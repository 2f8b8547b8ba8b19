"""The page's inline CSS and sort script, the policy that admits only them, and its colours.

The page makes no request of its own, so it can be opened from disk or mailed as one file.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

STYLE = (Path(__file__).parent / "page.css").read_text(encoding="utf-8")
# Click (or Enter on) a header to sort by its column, again for the other way; missing values last.
SCRIPT = (Path(__file__).parent / "sort.js").read_text(encoding="utf-8")
# Nothing may load from anywhere: images only from data: URIs, styles inline, the one script by its hash.
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{SCRIPT_HASH}'"

POSITIVE, NEGATIVE = (27, 120, 55), (118, 42, 131)  # green and purple: apart from the policy colours
POLICY_COLOURS = {"shared": "#0072B2", "isolated": "#D55E00"}  # as the plots draw them
