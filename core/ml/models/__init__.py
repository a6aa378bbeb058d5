"""Models: the DFlash drafter, the target during decoding (prefill, verify, rollback), hybrid
targets' verification, context features and masks, half-precision rows on a CPU, and the
sampling rule (``sampling`` the settings and the lossless acceptance, pure Python;
``sampling_torch`` its tensor side). May import ``formats`` only.
"""
