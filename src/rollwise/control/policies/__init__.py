"""rollwise.control.policies: one module per generation policy (uniform, dynamic, adaptive, early_stop, partial) and the prompt selector (posterior)."""
