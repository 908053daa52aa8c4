"""Validation: sandboxed grading, certification of environments both ways."""
