"""The deepseek41 family (DeepSeek V4.1; docs/V41.md)."""
