"""Engine: encode a graph and rules into egglog, saturate, extract for a target, decode."""
