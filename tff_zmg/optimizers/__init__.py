"""Projected and adaptive optimizers as `tff.learning.optimizers.Optimizer`s."""

from tff_zmg.optimizers.coupled_weight_decay import build_coupled_weight_decay
from tff_zmg.optimizers.global_gc import build_global_gc_sgd
from tff_zmg.optimizers.local_gc_sgdm import build_local_gc_sgdm
from tff_zmg.optimizers.proximal import build_proximal
from tff_zmg.optimizers.server_adam import build_server_adam
from tff_zmg.optimizers.zmg_sgdm import build_zmg_sgdm

__all__ = [
    'build_coupled_weight_decay',
    'build_global_gc_sgd',
    'build_local_gc_sgdm',
    'build_proximal',
    'build_server_adam',
    'build_zmg_sgdm',
]
