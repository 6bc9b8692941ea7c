"""What the project measures and develops the fix with: the trained target and drafts, acceptance, the
bench, mutation testing, the develop tree and the pull requests. It may import ``product`` and
``harness``; nothing imports it but the commands' table (``cli.py``, by name)."""
