"""Events -> figures and escaped HTML. Pure: no torch, no Gradio.

Every view is a function of events (or of one folded step), so a trace recorded anywhere
redraws the same way. Colours come from `legend` only.
"""
