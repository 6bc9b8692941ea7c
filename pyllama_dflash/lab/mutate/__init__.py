"""Mutation testing of the harness: plant one fault in the fix, build it, see what notices."""
