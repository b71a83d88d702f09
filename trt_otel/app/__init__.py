"""The program's face to people and tools.

The command line, its arguments and configuration, the build and program sessions, ``run``,
fleets and the MCP server.
"""
