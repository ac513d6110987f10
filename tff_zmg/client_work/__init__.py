"""Client work that TFF's `build_model_delta_client_work` cannot express.

`corrected_sgdm`: FedRKMGC's stateful client work.
"""

from tff_zmg.client_work import corrected_sgdm
