"""How every program starts and ends: libraries quieted, stop signals (`stops`), exit
statuses, failures turned into one line."""
