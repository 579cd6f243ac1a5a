"""Stage 1, the models: the embedded assets, GGUF conversion, backbone loading and the lookahead adapter."""
