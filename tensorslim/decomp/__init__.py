"""Pure tensor -> factors decompositions (NumPy/PyTorch in, factors out)."""

from tensorslim.decomp.svd import truncated_svd as truncated_svd
