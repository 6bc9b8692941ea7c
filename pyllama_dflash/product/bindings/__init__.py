"""Raw binding layer: cffi declarations (decl/), their build script (ffibuild) and loader (ffi).

Nothing here owns native objects; see ``pyllama_dflash.product.owning`` and ``pyllama_dflash.product.api``.
"""
