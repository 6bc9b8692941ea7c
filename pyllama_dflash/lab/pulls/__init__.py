"""``pyllama-dflash pulls``: the pull requests of ``patches/pulls``, each shown as upstream would review it:
its test failing on b11434 with the fixes' prerequisites, and passing with the fixes."""
