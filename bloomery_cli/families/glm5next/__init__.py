"""glm5next (GLM-5.3): its HF and GGUF readers and its plan terms."""
