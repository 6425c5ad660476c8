"""audio: speech to text: decoding audio files and Whisper's log-mel features (decode,
mel), its tokens, decoding rules, long-form and batched drivers and output formats
(tokens, logits, transcribe, formats)."""
