"""What a user installs and calls: the bindings and the objects that own native state, the API over them,
the builder of the variants, the child processes that run them, and the remedy (``upgrade``). It imports
nothing of ``harness`` or ``lab``."""
