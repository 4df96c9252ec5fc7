"""Building blocks shared by the architectures: norms, rope, attention, FFN, MoE."""
