"""How every program starts and ends: libraries quieted, exit statuses, failures turned
into one line."""
