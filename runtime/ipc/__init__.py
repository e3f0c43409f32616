"""How the server's three processes talk: `messages` (every message they exchange over zmq, as
small frozen dataclasses, and the one encode/decode pair) and `sockets` (the ipc:// endpoints in
a private directory, the PUSH / PULL sockets, and a child's death with its parent).

  TokenizerManager --TokenizedGenerateReq / AbortReq / ...--> Scheduler
  Scheduler --BatchTokenIDOut--> Detokenizer --BatchStrOut--> TokenizerManager

Messages carry sampling parameters as the frozen `SamplingParams` (sampling/) and a grammar as
the regex the door lowered it to (constrained/), so this package sits above those two.
"""
