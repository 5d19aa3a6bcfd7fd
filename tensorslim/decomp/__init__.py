"""Pure tensor -> factors decompositions (NumPy/PyTorch in, factors out)."""
