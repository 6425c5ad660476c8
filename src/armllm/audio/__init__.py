"""Speech to text: Whisper's audio input, tokens, decoding rules and output formats."""
