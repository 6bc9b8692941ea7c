"""A reference model of the DFlash draft, written from its definition, and what is built on it.

- ``weights``: the draft's hyperparameters and tensors read from the same GGUF files llama.cpp loads
  (the draft, and the target whose token embeddings and output head it borrows);
- ``forward``: the draft's forward pass over an array module (numpy here, ``jax.numpy`` for
  training), so the model llama.cpp is checked against and the model that is trained are one copy;
- ``corpus``: conversations with images run through the target by llama.cpp itself, kept as the
  rows' layer features and tokens (the training data);
- ``train`` (the ``train`` extra, JAX): the DFlash recipe on that corpus, written back as a GGUF.
"""
