//! A sandbox's files over HTTP: read, write, remove, list, and folders as tar
//! archives both ways.

use super::*;

pub(super) async fn read_file(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Q(q): Q<PathQuery>,
) -> Result<Response, ApiError> {
    let data = file_op(&a, &c, &id, &q.path, |sb, p| sb.read_file(p)).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

pub(super) async fn write_file(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Q(q): Q<PathQuery>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let n = body.len();
    file_op(&a, &c, &id, &q.path, move |sb, p| sb.write_file(p, &body)).await?;
    Ok(Json(json!({"path": q.path, "bytes": n})))
}

pub(super) async fn remove_file(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Q(q): Q<PathQuery>,
) -> Result<Json<Value>, ApiError> {
    let rec = q.recursive;
    file_op(&a, &c, &id, &q.path, move |sb, p| sb.remove(p, rec)).await?;
    Ok(Json(json!({"path": q.path, "removed": true})))
}

pub(super) async fn list_files(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Q(q): Q<PathQuery>,
) -> Result<Json<Value>, ApiError> {
    let entries = file_op(&a, &c, &id, &q.path, |sb, p| sb.list(p)).await?;
    let items: Vec<Value> = entries
        .into_iter()
        .map(|d| {
            json!({
                "name": d.name,
                "type": match d.kind {
                    tessera_sandbox::FileKind::File => "file",
                    tessera_sandbox::FileKind::Dir => "dir",
                    tessera_sandbox::FileKind::Symlink => "symlink",
                    tessera_sandbox::FileKind::Other => "other",
                },
                "size": d.size,
            })
        })
        .collect();
    Ok(Json(json!({"path": q.path, "items": items})))
}

pub(super) fn tar_limits() -> TarLimits {
    TarLimits {
        max_archive_bytes: MAX_ARCHIVE_BYTES,
        ..TarLimits::default()
    }
}

pub(super) async fn upload_tar(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Q(q): Q<PathQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    c.require(Role::Developer)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if !ct.starts_with("application/x-tar") {
        return Err(ApiError::new(
            Code::UnsupportedMediaType,
            format!("Content-Type {ct:?}: send a tar archive as application/x-tar"),
        ));
    }
    let inner = enabled(&a)?;
    let e = inner.get(&c, &id)?;
    let limits = tar_limits();
    // Read with this route's own limit (the server's body limit is for JSON).
    let data = axum::body::to_bytes(body, MAX_ARCHIVE_BYTES as usize)
        .await
        .map_err(|err| {
            ApiError::new(
                Code::PayloadTooLarge,
                format!("reading the archive ({err}); send at most {MAX_ARCHIVE_BYTES} bytes"),
            )
        })?;
    let p = q.path.clone();
    let sum = blocking(move || e.sandbox.upload_tar_with(&p, &data, &limits))
        .await?
        .map_err(|err| file_error(&id, &q.path, err))?;
    Ok(Json(json!({
        "path": q.path, "entries": sum.entries, "files": sum.files,
        "dirs": sum.dirs, "links": sum.links, "bytes": sum.bytes,
    })))
}

pub(super) async fn download_tar(
    State(a): State<App>,
    c: Caller,
    Path(id): Path<String>,
    Q(q): Q<PathQuery>,
) -> Result<Response, ApiError> {
    let limits = tar_limits();
    let data = file_op(&a, &c, &id, &q.path, move |sb, p| {
        sb.download_tar_with(p, &limits)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], data).into_response())
}
