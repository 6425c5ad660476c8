/* api: the chat page's calls to the server it came from: the served model's id
   (GET /v1/models) and a streamed chat completion (POST /v1/chat/completions,
   server-sent events), with the API key, if any, as a Bearer header. Errors,
   as an HTTP status or as an error event in the stream, become ApiError. */

// relative URLs: the page also works behind a proxy that serves it under a prefix
const MODELS_URL = "v1/models";
const CHAT_URL = "v1/chat/completions";

export class ApiError extends Error {
  /** status: the HTTP status (401 asks for an API key), or 0 for a network failure. */
  constructor(message, status) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

function headers(apiKey) {
  const result = { "Content-Type": "application/json" };
  if (apiKey) result.Authorization = `Bearer ${apiKey}`;
  return result;
}

async function send(url, init) {
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(`cannot reach the server (${err.message})`, 0);
  }
  if (!response.ok) throw new ApiError(await errorMessage(response), response.status);
  return response;
}

// the message of an OpenAI error body {"error": {"message", ...}}, else the status line
async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body?.error?.message) return body.error.message;
  } catch {
    // not JSON: fall through to the status line
  }
  return `HTTP ${response.status} ${response.statusText}`.trim();
}

/** The id of the model the server serves. */
export async function fetchModelId(apiKey) {
  const response = await send(MODELS_URL, { headers: headers(apiKey) });
  const body = await response.json();
  return body.data?.[0]?.id ?? "";
}

/** Streams a chat completion: yields each event's JSON object (chunks, then the
    usage chunk when asked for), until "data: [DONE]". Aborting `signal` ends it
    with an AbortError. */
export async function* streamChat(request, apiKey, signal) {
  const response = await send(CHAT_URL, {
    method: "POST",
    headers: headers(apiKey),
    body: JSON.stringify({ ...request, stream: true }),
    signal,
  });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value, { stream: !done });
    const events = buffer.split(/\r?\n\r?\n/);
    buffer = done ? "" : events.pop();  // the last piece may be an event cut in half
    for (const event of events) {
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice("data:".length).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(chunk.error.message || "generation failed", 500);
      yield chunk;
    }
    if (done) throw new ApiError("the server closed the stream before the reply ended", 0);
  }
}
