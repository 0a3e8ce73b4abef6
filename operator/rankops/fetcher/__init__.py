"""The model fetcher: the program every serving pod's `fetch-model` init container and the
equivalence gate's `fetch-reference` run (`rankops fetch-model`, commands/fetch.py). It runs in
those pods, not in the operator: it imports nothing else of rankops."""
