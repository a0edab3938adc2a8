// The arbiter's HTTP API, with the token kept in sessionStorage (gone when the tab closes).

const TOKEN_KEY = 'agora-token';

export const session = {
  get token() { return sessionStorage.getItem(TOKEN_KEY); },
  set token(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  },
};

/** An answer other than 2xx, carrying the problem+json `code` and `detail`. */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || `the server answered ${status}`);
    this.status = status;
    this.code = problem?.code;
  }
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${session.token}`, ...extra };
}

/** GET a JSON document of the API. */
export async function get(path) {
  const response = await fetch(path, { headers: headers() });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

/** POST to the API (no body); the JSON answer. */
export async function post(path) {
  const response = await fetch(path, { method: 'POST', headers: headers() });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

/**
 * Follows a server-sent event stream with the token in a header (EventSource cannot send one,
 * and a token in the URL would land in access logs). Reconnects after errors and server
 * restarts, resuming with Last-Event-ID. Calls onEvent(type, data, id) and onState('live' |
 * 'reconnecting'); returns a function that stops it.
 */
export function follow(path, lastId, onEvent, onState) {
  const controller = new AbortController();
  let retry = 500;
  (async () => {
    while (!controller.signal.aborted) {
      try {
        const extra = lastId == null ? {} : { 'Last-Event-ID': String(lastId) };
        const response = await fetch(path, { headers: headers(extra), signal: controller.signal });
        if (!response.ok) throw new ApiError(response.status, null);
        onState('live');
        retry = 500;
        for await (const event of serverSentEvents(response.body)) {
          if (event.id != null) lastId = event.id;
          onEvent(event.type, JSON.parse(event.data), lastId);
        }
      } catch (error) {
        if (controller.signal.aborted) return;
      }
      onState('reconnecting');
      await new Promise((resolve) => setTimeout(resolve, retry));
      retry = Math.min(retry * 2, 5000);
    }
  })();
  return () => controller.abort();
}

/** Parses an SSE body into {type, data, id} events (comments and keep-alives skipped). */
async function* serverSentEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { type: 'message', data: '', id: null };
      for (const line of block.split('\n')) {
        const colon = line.indexOf(':');
        if (colon <= 0) continue;
        const field = line.slice(0, colon);
        const text = line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') event.type = text;
        else if (field === 'data') event.data += text;
        else if (field === 'id') event.id = text;
      }
      if (event.data) yield event;
    }
  }
}
