"""A tiny vision-language target that writes: a character vocabulary that round-trips through
llama.cpp, a qwen35 core trained here on the prose Python ships and on captions of rendered
scenes, and the reference forward that judges llama.cpp's logits for it.

It is a cost and behaviour model of a real pair, not a real VLM: small enough to train on two
cores, trained enough that a draft has language to predict and an image changes what follows.
Training needs the ``train`` extra (JAX); reading, writing and judging need numpy only.
"""
