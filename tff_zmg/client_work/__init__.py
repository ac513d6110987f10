"""Client work that TFF's `build_model_delta_client_work` cannot express.

`corrected_sgdm`: FedRKMGC's stateful client work.
`fedgps_client`: FedGPS's (surrogate objective, look-ahead gradients).
"""

from tff_zmg.client_work import corrected_sgdm
from tff_zmg.client_work import fedgps_client
