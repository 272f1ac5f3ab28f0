"""specviz: see and measure speculative decoding. The engine streams typed events (specviz.events);
metrics and viz are pure functions of them; ui wires them to Gradio."""
__version__ = "0.1.0"
