"""Layer families. Importing this package registers every family's config type with :mod:`tensorslim.registry`.

Each family is one module holding its config dataclass, its layer (``from_dense``, ``to_dense``, ``num_params``,
``flops``) and its :func:`tensorslim.registry.register_transform` call; a new family is one more import here.
"""

from tensorslim.layers import adapters as adapters
from tensorslim.layers import cola_m as cola_m
from tensorslim.layers import kron as kron
from tensorslim.layers import lax as lax
from tensorslim.layers import lax_tt as lax_tt
from tensorslim.layers import lora as lora
from tensorslim.layers import lowrank as lowrank
from tensorslim.layers import lowrank_embedding as lowrank_embedding
from tensorslim.layers import memory as memory
from tensorslim.layers import tt as tt
from tensorslim.layers import tt_embedding as tt_embedding
