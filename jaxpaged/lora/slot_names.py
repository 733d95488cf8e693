"""The names LoRA slot arrays go by among a layer's weights (models/llama.py reads them, lora/slots.py writes them)."""


def lora_a_name(projection: str) -> str:
    """The A slots of `projection` ("q_proj" -> "lora_a.q_proj")."""
    return f"lora_a.{projection}"


def lora_b_name(projection: str) -> str:
    """The (scaled) B slots of `projection`."""
    return f"lora_b.{projection}"
