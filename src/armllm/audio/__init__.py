"""audio: speech in — decoding, resampling, Whisper features, and (other modules, added by
others) Whisper's decoding."""
