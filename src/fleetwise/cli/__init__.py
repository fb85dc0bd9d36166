"""L6: the `fleetwise` command line. Each subcommand lives in its own module with `register()`."""
