"""The two policies as models: HF policies with sampling and the GRPO step, their one way of being built
(``loading``) and of being told how to sample (``sampling``), checkpoint I/O, the built-in tiny model,
supervised warm starts, fast CPU generation, the vLLM backend and the GPU memory plan.
"""
