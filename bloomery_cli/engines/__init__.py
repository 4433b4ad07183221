"""Other engines under the gate (docs/ENGINES.md): an engine's greedy runs, plain and drafted, written as one
engine-agnostic record (``record``), judged against the float64 reference with the gate's lines (``judge``).
llama.cpp runs here (``llamacpp``: built from the llama-cpp-python 0.3.36 sdist by ``build``)."""
