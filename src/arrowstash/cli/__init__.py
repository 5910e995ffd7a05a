"""The ``arrowstash`` command line: ``main`` dispatches to the subcommands' modules."""
