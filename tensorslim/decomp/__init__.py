"""Pure tensor -> factors decompositions (NumPy/PyTorch in, factors out)."""

from tensorslim.decomp.cp_check import cp_tensor_check as cp_tensor_check
from tensorslim.decomp.cp_mixed import cp_mixed_precision as cp_mixed_precision
from tensorslim.decomp.gmm import gmm_moments as gmm_moments
from tensorslim.decomp.kron import kron_rearrange as kron_rearrange
from tensorslim.decomp.kron import nearest_kronecker as nearest_kronecker
from tensorslim.decomp.shapes import factorize as factorize
from tensorslim.decomp.shapes import pad_and_factorize as pad_and_factorize
from tensorslim.decomp.svd import truncated_svd as truncated_svd
from tensorslim.decomp.tt import tt_matrix_svd as tt_matrix_svd
from tensorslim.decomp.tt import tt_svd as tt_svd
from tensorslim.decomp.tt import ttm_svd as ttm_svd
