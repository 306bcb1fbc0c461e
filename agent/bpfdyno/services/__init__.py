"""Transport-free façades over the daemon's state, shared by every front end."""
