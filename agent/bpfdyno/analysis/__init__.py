"""Reading trace files and comparing ranks: the file's structure (`tracefile`), its facts in
one pass (`trace_facts`), its numbers (`summary`), one rank's evidence (`evidence`) and the
job's verdict (`verdict`). Built on `core` and the API's records (`rpc`) alone, so the agent
and every client analyse a file the same way.
"""
