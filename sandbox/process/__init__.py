"""The process room: starting, stopping, tree-killing and reaping processes, and handing them
descriptors, for every layer (sandbox/README.md lists its modules). Nothing is imported here:
each user imports the module it needs, and a worker only the light ones."""
