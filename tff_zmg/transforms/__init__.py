"""The mechanisms, one pure function (or a few) each, opening with its formula and source.

`projection` (the zero-mean projection and its layer masks), `correction` (FedRKMGC's
correction updates: raw, Krasnosel'skii-Mann, fast KM), `rectification` (FedGPS's non-self
direction), `prototypes` (FedGPS's class prototypes), `surrogate` (FedGPS's surrogate data).
Nothing here knows TFF's templates: the optimizers and the algorithms' files wrap them.
"""
