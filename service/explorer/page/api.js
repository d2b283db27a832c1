// The public HTTP API, as the explorer calls it: JSON in and out, the API key (kept in
// sessionStorage for this tab only, never in the URL) as a bearer token, problem details as
// errors.

const KEY = "attrserve-api-key";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

/** An API answer that is not 2xx: the problem document (RFC 9457) it carried. */
export class Problem extends Error {
  constructor(problem) {
    super(problem.detail || problem.title || `HTTP ${problem.status}`);
    this.problem = problem;
  }

  describe() {
    const p = this.problem;
    const where = p.errors && p.errors[0] && p.errors[0].loc ? ` (at ${p.errors[0].loc.join(".")})` : "";
    return `${p.title || "Error"} (${p.status}): ${p.detail || ""}${where}`;
  }
}

/**
 * Call the API. `body`: sent as JSON; `raw`: {data, type} sent as it is. Answers the parsed
 * JSON, or a Blob for other media types; throws a Problem for a 4xx/5xx.
 */
export async function call(path, { method = "GET", body, raw, signal } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  let payload;
  if (raw !== undefined) {
    payload = raw.data;
    headers["Content-Type"] = raw.type;
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, { method, headers, body: payload, signal });
  const type = response.headers.get("content-type") || "";
  if (!response.ok) {
    let problem = { status: response.status, title: response.statusText };
    if (type.includes("json")) problem = { ...problem, ...(await response.json()) };
    throw new Problem(problem);
  }
  return type.includes("json") ? response.json() : response.blob();
}

/** A Float32Array as the API's base64 tensor: little-endian bytes (what browsers use). */
export function tensorB64(values, shape) {
  const bytes = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return { dtype: "float32", shape, b64: btoa(text) };
}
