"""Raw binding layer: cffi declarations (decl/), their build script (ffibuild) and loader (ffi).

Nothing here owns native objects; see ``pyllama_dflash._internals`` and ``pyllama_dflash.api``.
"""
