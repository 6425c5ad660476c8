/* store: what the chat page keeps in the browser's localStorage: the
   conversations (each with its messages), which one is open, the chat settings
   and the API key. Nothing here talks to the server. */

const KEYS = {
  conversations: "armllm.conversations",
  current: "armllm.current",
  settings: "armllm.settings",
  apiKey: "armllm.apiKey",
};

// empty sampling fields mean "the model's default" (the server fills them in)
export const DEFAULT_SETTINGS = {
  systemPrompt: "",
  temperature: "",
  topP: "",
  maxTokens: "",
  ignoreEos: false,
};

const TITLE_CHARS = 60;  // a conversation's title: the start of its first message

function read(key, fallback) {
  try {
    const text = localStorage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;  // storage disabled or a value not ours
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch (err) {
    console.warn("armllm: could not save to localStorage:", err);  // quota full
  }
}

/** The conversations, newest first; each {id, title, updated, messages}, a message
    {role, content, reasoning?, stats?, error?}. */
export class ConversationStore {
  constructor() {
    const saved = read(KEYS.conversations, []);
    this.conversations = Array.isArray(saved) ? saved : [];
    this.currentId = read(KEYS.current, null);
    if (!this.get(this.currentId)) this.currentId = this.conversations[0]?.id ?? null;
  }

  get(id) {
    return this.conversations.find((c) => c.id === id) || null;
  }

  get current() {
    return this.get(this.currentId);
  }

  /** A new, empty conversation, made the open one (saved once it has a message). */
  create() {
    const conversation = { id: newId(), title: "New chat", updated: Date.now(), messages: [] };
    this.conversations.unshift(conversation);
    this.select(conversation.id);
    return conversation;
  }

  select(id) {
    this.currentId = id;
    write(KEYS.current, id);
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.select(this.conversations[0]?.id ?? null);
    this.save();
  }

  /** Adds a message to a conversation (its first user message names it). */
  append(conversation, message) {
    if (!conversation.messages.some((m) => m.role === "user") && message.role === "user") {
      const line = message.content.trim().split("\n")[0];
      conversation.title = line.length > TITLE_CHARS ? line.slice(0, TITLE_CHARS) + "…" : line;
    }
    conversation.messages.push(message);
    this.touch(conversation);
  }

  /** Marks a conversation as just changed: first in the list, and saved. */
  touch(conversation) {
    conversation.updated = Date.now();
    this.conversations.sort((a, b) => b.updated - a.updated);
    this.save();
  }

  save() {
    write(KEYS.conversations, this.conversations.filter((c) => c.messages.length));
  }
}

export function loadSettings() {
  const saved = read(KEYS.settings, {});
  return { ...DEFAULT_SETTINGS, ...(saved && typeof saved === "object" ? saved : {}) };
}

export function saveSettings(settings) {
  write(KEYS.settings, settings);
}

export function loadApiKey() {
  return read(KEYS.apiKey, "") || "";
}

export function saveApiKey(key) {
  write(KEYS.apiKey, key);
}

function newId() {
  return crypto.randomUUID ? crypto.randomUUID()
    : `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
}
