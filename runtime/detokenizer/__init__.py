"""The detokenizer process: token ids in (`messages.BatchTokenIDOut` from the scheduler), text
deltas out (`messages.BatchStrOut` to the TokenizerManager). `detokenizer` is the incremental
decoder (correct across multi-byte characters and byte-level BPE), `detokenizer_process` its
zmq loop.
"""
