"""``bloomery bench``: decode speed against the bandwidth roofline, llama.cpp and HF transformers."""
