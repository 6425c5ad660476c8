"""tokens: Whisper's special tokens and its text tokenizer, as ids.

A Whisper vocabulary is the text tokens, then <|endoftext|>, <|startoftranscript|>,
one token per language (the first N of LANGUAGES, in this order: tiny … large-v2 have
99, large-v3 has 100), <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>,
<|nospeech|> (<|nocaptions|> in the older vocabularies), <|notimestamps|>, and the
timestamps <|0.00|> … <|30.00|> in steps of 0.02 s. tokenizer.json does not always
list the timestamps, so the model's vocabulary size says how many there are.

WhisperTokens owns those ids, the decoder prompt's start (`sot_sequence`), the set of
non-speech tokens Whisper suppresses for suppress_tokens=[-1], the leading-space
convention of prompts, and decoding token ids back to text without the timestamps."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

# Whisper's languages: code -> name, in the order of their tokens in the vocabulary
LANGUAGES: dict[str, str] = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
    "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak",
    "te": "telugu", "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian",
    "az": "azerbaijani", "sl": "slovenian", "kn": "kannada", "et": "estonian",
    "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian",
    "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian",
    "sw": "swahili", "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala",
    "km": "khmer", "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans",
    "oc": "occitan", "ka": "georgian", "be": "belarusian", "tg": "tajik", "sd": "sindhi",
    "gu": "gujarati", "am": "amharic", "yi": "yiddish", "lo": "lao", "uz": "uzbek",
    "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk",
    "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan",
    "tl": "tagalog", "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian",
    "ln": "lingala", "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese",
    "yue": "cantonese",
}
# other names people use for some of those languages
LANGUAGE_ALIASES: dict[str, str] = {
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht",
    "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa", "moldavian": "ro",
    "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh",
}
TASKS = ("transcribe", "translate")
# a vocabulary this large has the language and task tokens in use (the .en models' 51864 not)
MULTILINGUAL_VOCAB_SIZE = 51865
TIME_PRECISION = 0.02  # seconds per timestamp token

# what the non-speech set is made of (speaker tags, music, brackets), as Whisper
# computes it: a symbol is suppressed where it is one token, with or without a
# leading space; the musical signs (U+2640-267F, whose UTF-8 forms share two
# leading bytes) by their first token whatever their length
_NON_SPEECH_SYMBOLS = (list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
                       + "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪"
                       .split())
_MUSICAL_SIGNS = "♩♪♫♬♭♮♯"


def language_code(language: str, available: tuple[str, ...] = tuple(LANGUAGES)) -> str:
    """The code of a language given by code ("en", "EN") or name ("English",
    "mandarin"); ValueError naming it and the valid codes if it is neither (or not
    one of `available`, the model's languages)."""
    key = language.strip().lower() if isinstance(language, str) else language
    if key in LANGUAGE_ALIASES:
        key = LANGUAGE_ALIASES[key]
    elif key not in LANGUAGES:
        key = next((code for code, name in LANGUAGES.items() if name == key), key)
    if key not in available:
        raise ValueError(f"language {language!r} is not one of this model's languages: "
                         f"{', '.join(available)}")
    return key


class WhisperTokens:
    """The ids of one Whisper model's special tokens, over its text tokenizer.

    vocab_size is the model's (its logits' length), multilingual None says it
    from the size (51865 and above: the language and task tokens are in use;
    the English-only models' prompts are <|startoftranscript|> alone)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, multilingual: bool | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.multilingual = (vocab_size >= MULTILINGUAL_VOCAB_SIZE if multilingual is None
                             else multilingual)
        self.eot = self._id("<|endoftext|>")
        self.sot = self._id("<|startoftranscript|>")
        self.translate = self._id("<|translate|>")
        self.transcribe = self._id("<|transcribe|>")
        self.sot_lm = self._id("<|startoflm|>")
        self.sot_prev = self._id("<|startofprev|>")
        no_speech = tokenizer.token_to_id("<|nospeech|>")
        self.no_speech = no_speech if no_speech is not None else self._id("<|nocaptions|>")
        self.no_timestamps = self._id("<|notimestamps|>")
        self.timestamp_begin = self.no_timestamps + 1
        if vocab_size <= self.timestamp_begin:
            raise ValueError(f"vocab_size {vocab_size} leaves no timestamp tokens after "
                             f"<|notimestamps|> ({self.no_timestamps})")
        n_languages = self.translate - self.sot - 1
        if not 0 < n_languages <= len(LANGUAGES):
            raise ValueError(f"the vocabulary has {n_languages} language tokens between "
                             f"<|startoftranscript|> and <|translate|>; Whisper knows "
                             f"{len(LANGUAGES)}")
        # code -> token id, in the vocabulary's order
        self.language_ids: dict[str, int] = {
            code: self.sot + 1 + i for i, code in enumerate(list(LANGUAGES)[:n_languages])}

    @classmethod
    def from_file(cls, tokenizer_json: str | Path, vocab_size: int,
                  multilingual: bool | None = None) -> WhisperTokens:
        """From a tokenizer.json (as CTranslate2 and HF checkpoints ship it)."""
        return cls(Tokenizer.from_file(str(tokenizer_json)), vocab_size, multilingual)

    def _id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"the tokenizer has no {token} token: not a Whisper tokenizer")
        return token_id

    @property
    def languages(self) -> tuple[str, ...]:
        """The codes a prompt may name: the model's languages, or "en" alone for an
        English-only model."""
        return tuple(self.language_ids) if self.multilingual else ("en",)

    def language_code(self, language: str) -> str:
        """The code of a language this model transcribes (by code or name, any case)."""
        return language_code(language, self.languages)

    def sot_sequence(self, language: str | None = "en", task: str = "transcribe",
                     timestamps: bool = True) -> list[int]:
        """The decoder prompt's start: <|startoftranscript|>, then on a multilingual
        model the language and the task, then <|notimestamps|> unless timestamps.
        language None stops after <|startoftranscript|> (language detection's
        prompt). An English-only model has no language or task tokens: it accepts
        language "en" (or None) and either task, as Whisper does."""
        if task not in TASKS:
            raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")
        sequence = [self.sot]
        if language is not None:
            code = self.language_code(language)
            if self.multilingual:
                sequence += [self.language_ids[code],
                             self.transcribe if task == "transcribe" else self.translate]
        if not timestamps:
            sequence.append(self.no_timestamps)
        return sequence

    def encode(self, text: str) -> list[int]:
        """Text tokens, as they are (no special tokens added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """An initial prompt's or a prefix's tokens: Whisper strips the text and puts
        one space before it, as text follows a space inside a transcript."""
        return self.encode(" " + text.strip())

    def decode(self, token_ids: list[int]) -> str:
        """The text of token ids, without special tokens and timestamps."""
        return self.tokenizer.decode([t for t in token_ids if t < self.eot])

    def decode_with_timestamps(self, token_ids: list[int]) -> str:
        """The text with each timestamp written "<|1.08|>" where it stands."""
        parts: list[str] = []
        text: list[int] = []
        for token in token_ids:
            if token >= self.timestamp_begin:
                parts += [self.decode(text), f"<|{self.timestamp_seconds(token):.2f}|>"]
                text = []
            else:
                text.append(token)
        return "".join([*parts, self.decode(text)])

    def timestamp_seconds(self, token: int) -> float:
        """The time a timestamp token stands for, from the window's start."""
        return (token - self.timestamp_begin) * TIME_PRECISION

    def is_timestamp(self, token: int) -> bool:
        return token >= self.timestamp_begin

    @cached_property
    def non_speech(self) -> tuple[int, ...]:
        """The tokens Whisper suppresses for suppress_tokens=[-1] so that a
        transcript holds no speaker tags or sound captions ("[DAVID]", "♪♪",
        "(LAUGHS)"): bracket and quoting symbols, and " -" and " '" where they
        would start a word (inside a word they stay allowed, as separate tokens)."""
        found = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in [*_NON_SPEECH_SYMBOLS, *_MUSICAL_SIGNS]:
            for ids in (self.encode(symbol), self.encode(" " + symbol)):
                if len(ids) == 1 or symbol in _MUSICAL_SIGNS:
                    found.add(ids[0])
        return tuple(sorted(found))

    def suppress_set(self, suppress_tokens: list[int] | tuple[int, ...] | None) -> tuple[int, ...]:
        """The tokens never to sample, from a suppress_tokens option as Whisper reads
        it: -1 stands for the non-speech set, and whenever the option names any
        token the task, <|startoftranscript|>, <|startofprev|>, <|startoflm|> and
        <|nospeech|> tokens are added. None or empty suppresses nothing at all, as
        in faster-whisper (openai-whisper still adds those special tokens)."""
        chosen = set()
        for token in suppress_tokens or ():
            if token == -1:
                chosen.update(self.non_speech)
            elif isinstance(token, int) and 0 <= token < self.vocab_size:
                chosen.add(token)
            else:
                raise ValueError(f"suppress_tokens holds {token!r}: not -1 or a token id "
                                 f"below {self.vocab_size}")
        if suppress_tokens:
            chosen.update((self.transcribe, self.translate, self.sot, self.sot_prev,
                           self.sot_lm, self.no_speech))
        return tuple(sorted(chosen))

    @property
    def blank(self) -> tuple[int, ...]:
        """What SuppressBlank forbids at a transcript's start: " " and <|endoftext|>."""
        return (*self.encode(" "), self.eot)
