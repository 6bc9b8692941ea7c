"""Acceptance after an image, measured on trained drafts.

``script``: the conversation and its phases; ``job``: the typed job a child runs (one column, some
conversations); ``worker``: the child; ``measure``: every column side by side, with intervals.
"""
