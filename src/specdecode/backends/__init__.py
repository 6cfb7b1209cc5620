"""Model backends: loading (models.py, checkpoint.py) in a precision (precision.py), the fast Llama
forward and its fused CPU kernels (fast_llama.py, kernels.py + kernels.cpp), the batched forward
(batch_model.py), the forward's return value (lm.py), int8 quantization (quant.py) and the tokenizer
check."""
