"""What the project tests the fix with: the slot loop, the references and oracles, the scenarios and the
matrix, the fuzzer with its engine, the llama-server checks, the soak and the tiny models. It imports
``product``, never ``lab``."""
