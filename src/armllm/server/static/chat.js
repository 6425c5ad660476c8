/* chat: the chat page's behaviour: the conversation list, the open conversation's
   messages (replies rendered as Markdown while they stream, then their tokens/s),
   sending a prompt and stopping its reply, the settings panel and the API key
   dialog. Storage is store.js's, the server calls api.js's. */
import { ApiError, fetchModelId, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import {
  ConversationStore, loadApiKey, loadSettings, saveApiKey, saveSettings,
} from "./store.js";

const MODEL_RETRY_MS = 1000;      // /v1/models answers 503 while the model loads
const PROMPT_MAX_HEIGHT_PX = 200;  // the prompt box grows with its text up to this
const STICKY_SCROLL_PX = 60;       // a reader this close to the end follows the stream

const $ = (id) => document.getElementById(id);
const store = new ConversationStore();
const settings = loadSettings();
let apiKey = loadApiKey();
let modelId = "";
let running = null;      // the generation in flight: {conversation, reply, controller}
let afterKey = [];       // what to retry once the user has entered an API key
const elements = new WeakMap();  // message -> its <article>, while shown

// ---- conversations and messages -------------------------------------------------

function renderConversationList() {
  const shown = store.conversations.filter((c) => c.messages.length || c.id === store.currentId);
  $("conversations").replaceChildren(...shown.map((conversation) => {
    const item = document.createElement("li");
    item.dataset.id = conversation.id;
    item.classList.toggle("active", conversation.id === store.currentId);
    const open = button(conversation.title, "open", () => openConversation(conversation.id));
    open.title = conversation.title;
    const remove = button("×", "delete", () => deleteConversation(conversation.id));
    remove.title = "Delete this conversation";
    remove.setAttribute("aria-label", remove.title);
    item.append(open, remove);
    return item;
  }));
}

function renderMessages() {
  const conversation = store.current;
  const box = $("messages");
  if (!conversation || !conversation.messages.length) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = modelId ? `Chat with ${modelId}` : "Start a conversation";
    box.replaceChildren(empty);
    return;
  }
  box.replaceChildren(...conversation.messages.map(messageElement));
  box.scrollTop = box.scrollHeight;
}

function messageElement(message) {
  const article = document.createElement("article");
  article.className = `message ${message.role}`;
  if (message.role === "assistant") {
    const reasoning = document.createElement("details");
    reasoning.className = "reasoning";
    reasoning.innerHTML = "<summary>Thinking</summary><div class=\"reasoning-text\"></div>";
    article.append(reasoning);
  }
  const content = document.createElement("div");
  content.className = "content";
  const meta = document.createElement("div");
  meta.className = "meta";
  article.append(content, meta);
  elements.set(message, article);
  fill(article, message);
  return article;
}

// a message's element (if shown) redrawn after the message changed
function refresh(message) {
  const article = elements.get(message);
  if (article?.isConnected) fill(article, message);
}

// the message's text, stats or error into its element
function fill(article, message) {
  const content = article.querySelector(".content");
  if (message.role === "user") {
    content.textContent = message.content;
  } else {
    const reasoning = article.querySelector(".reasoning");
    reasoning.hidden = !message.reasoning;
    if (message.reasoning) {
      reasoning.querySelector(".reasoning-text").innerHTML = renderMarkdown(message.reasoning);
    }
    content.innerHTML = renderMarkdown(message.content);
  }
  article.classList.toggle("streaming", running?.reply === message);
  const meta = article.querySelector(".meta");
  meta.replaceChildren();
  if (message.stats) meta.append(statsText(message));
  if (message.error) {
    const error = document.createElement("span");
    error.className = "error";
    error.textContent = message.error;
    meta.append(error);
  }
}

function statsText({ stats, stopped }) {
  const parts = [`${stats.tokens} tokens`];
  if (stats.tokensPerSecond) parts.push(`${stats.tokensPerSecond.toFixed(1)} tokens/s`);
  if (stopped) parts.push("stopped");
  const span = document.createElement("span");
  span.className = "stats";
  span.textContent = parts.join(" · ");
  return span;
}

function openConversation(id) {
  store.select(id);
  renderConversationList();
  renderMessages();
  $("prompt").focus();
}

function newConversation() {
  const current = store.current;
  if (!current || current.messages.length) store.create();
  renderConversationList();
  renderMessages();
  $("prompt").focus();
}

function deleteConversation(id) {
  if (running?.conversation.id === id) running.controller.abort();
  store.remove(id);
  renderConversationList();
  renderMessages();
}

// ---- generation -----------------------------------------------------------------

async function submitPrompt(event) {
  event.preventDefault();
  const prompt = $("prompt");
  const text = prompt.value.trim();
  if (!text || running) return;
  const conversation = store.current || store.create();
  store.append(conversation, { role: "user", content: text });
  prompt.value = "";
  fitPrompt();
  renderConversationList();
  renderMessages();
  await generate(conversation);
}

/** Streams the assistant's reply to a conversation that ends with the user's turn. */
async function generate(conversation) {
  const reply = { role: "assistant", content: "" };
  const controller = new AbortController();
  const request = chatRequest(conversation.messages);
  running = { conversation, reply, controller };
  conversation.messages.push(reply);
  setBusy(true);
  showNewMessage(conversation, reply);
  // tokens/s: completion tokens over the time from the first token to the last
  let first = 0, last = 0, chunks = 0, usageTokens = null, needsKey = false;
  try {
    for await (const chunk of streamChat(request, apiKey, controller.signal)) {
      if (chunk.usage) usageTokens = chunk.usage.completion_tokens;
      const delta = chunk.choices?.[0]?.delta;
      const text = delta?.content || "";
      const thought = delta?.reasoning_content || "";
      if (!text && !thought) continue;
      last = performance.now();
      first ||= last;
      chunks++;
      reply.content += text;
      if (thought) reply.reasoning = (reply.reasoning || "") + thought;
      scheduleFill(reply);
    }
  } catch (err) {
    if (err.name === "AbortError") reply.stopped = true;
    else if (err instanceof ApiError && err.status === 401) needsKey = true;
    else reply.error = err.message;
  }
  running = null;
  setBusy(false);
  if (needsKey) {
    conversation.messages.splice(conversation.messages.indexOf(reply), 1);
    renderMessages();
    askForKey(() => generate(conversation));
    return;
  }
  const tokens = usageTokens ?? chunks;
  const seconds = (last - first) / 1000;
  if (!reply.error || tokens) {
    reply.stats = { tokens, tokensPerSecond: seconds > 0 ? tokens / seconds : 0 };
  }
  store.touch(conversation);
  refresh(reply);
  renderConversationList();
}

function chatRequest(messages) {
  const turns = [];
  if (settings.systemPrompt.trim()) turns.push({ role: "system", content: settings.systemPrompt });
  for (const { role, content, error } of messages) {
    if (error && !content) continue;  // a failed reply is shown, not sent back
    turns.push({ role, content });
  }
  const request = { messages: turns, stream_options: { include_usage: true } };
  if (modelId) request.model = modelId;
  const numbers = { temperature: "temperature", top_p: "topP", max_tokens: "maxTokens" };
  for (const [field, setting] of Object.entries(numbers)) {
    const value = String(settings[setting]).trim();
    if (value !== "") request[field] = Number(value);
  }
  if (settings.ignoreEos) request.ignore_eos = true;
  return request;
}

function showNewMessage(conversation, message) {
  if (conversation !== store.current) return;
  const box = $("messages");
  if (!box.querySelector(".message")) box.replaceChildren();
  box.append(messageElement(message));
  box.scrollTop = box.scrollHeight;
}

// streamed text is drawn once per frame, however many chunks arrive in between
let pendingFill = null;
function scheduleFill(message) {
  if (pendingFill === message) return;
  pendingFill = message;
  requestAnimationFrame(() => {
    pendingFill = null;
    const box = $("messages");
    const following = box.scrollHeight - box.scrollTop - box.clientHeight < STICKY_SCROLL_PX;
    refresh(message);
    if (following) box.scrollTop = box.scrollHeight;
  });
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  document.body.classList.toggle("busy", busy);
}

// ---- model, API key, settings ---------------------------------------------------

async function loadModel() {
  try {
    modelId = await fetchModelId(apiKey);
    $("model").textContent = modelId;
    showStatus("");
    if (!store.current?.messages.length) renderMessages();
  } catch (err) {
    if (err.status === 401) {
      showStatus("This server needs an API key.");
      askForKey(loadModel);
    } else {
      showStatus(err.message);
      if (err.status === 503 || err.status === 0) setTimeout(loadModel, MODEL_RETRY_MS);
    }
  }
}

function showStatus(text) {
  $("status").textContent = text;
  $("status").hidden = !text;
}

function askForKey(retry) {
  if (retry) afterKey.push(retry);
  const dialog = $("key-dialog");
  $("key-refused").hidden = !apiKey;  // a key is kept, so the server refused it
  $("api-key").value = apiKey;
  if (!dialog.open) dialog.showModal();
}

function keyDialogClosed() {
  const retries = afterKey;
  afterKey = [];
  if ($("key-dialog").returnValue !== "save") return;
  apiKey = $("api-key").value.trim();
  saveApiKey(apiKey);
  if (!retries.length) retries.push(loadModel);
  for (const retry of retries) retry();
}

const SETTING_INPUTS = {
  systemPrompt: "system-prompt", temperature: "temperature", topP: "top-p",
  maxTokens: "max-tokens", ignoreEos: "ignore-eos",
};

function bindSettings() {
  for (const [setting, id] of Object.entries(SETTING_INPUTS)) {
    const input = $(id);
    const isCheckbox = input.type === "checkbox";
    if (isCheckbox) input.checked = Boolean(settings[setting]);
    else input.value = settings[setting];
    input.addEventListener("input", () => {
      settings[setting] = isCheckbox ? input.checked : input.value;
      saveSettings(settings);
    });
  }
}

function toggleSettings() {
  const panel = $("settings");
  panel.hidden = !panel.hidden;
  $("settings-toggle").setAttribute("aria-expanded", String(!panel.hidden));
}

// ---- wiring ---------------------------------------------------------------------

function button(text, className, onClick) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = className;
  element.textContent = text;
  element.addEventListener("click", onClick);
  return element;
}

function fitPrompt() {
  const prompt = $("prompt");
  prompt.style.height = "auto";
  const borders = prompt.offsetHeight - prompt.clientHeight;  // scrollHeight leaves them out
  prompt.style.height = `${Math.min(prompt.scrollHeight + borders, PROMPT_MAX_HEIGHT_PX)}px`;
}

function init() {
  $("composer").addEventListener("submit", submitPrompt);
  $("prompt").addEventListener("input", fitPrompt);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => running?.controller.abort());
  $("new-chat").addEventListener("click", newConversation);
  $("settings-toggle").addEventListener("click", toggleSettings);
  $("change-key").addEventListener("click", () => askForKey(null));
  $("key-dialog").addEventListener("close", keyDialogClosed);
  bindSettings();
  fitPrompt();
  renderConversationList();
  renderMessages();
  loadModel();
  $("prompt").focus();
}

init();
