"""L4: discrete-event fleet simulator driving engines, KV links, routing and faults in virtual time."""
