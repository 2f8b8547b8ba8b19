"""Models: tiny local scales, policies that route roles to parameters."""
