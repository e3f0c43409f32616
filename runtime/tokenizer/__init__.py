"""Text <-> token ids: the model's HF tokenizer files behind a small facade (`Tokenizer`: encode,
decode, tokens of ids, the chat template). Read by every process that sees text: the HTTP front
(tokenizing at the door), the detokenizer, the grammar engines (their vocabulary) and the
scheduler's setup. A plain fast tokenizer loads without torch, so the processes that only tokenize
do not load it.
"""
