"""The Textual view. One widget or screen per module, each with its DEFAULT_CSS. Importing this
package imports nothing (``zeroscope replay --headless`` reuses tui.feed without Textual)."""
