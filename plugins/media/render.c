/*
 * plugins/media/render.c - turning an original into a WebP thumbnail: decoding with
 * libvips, encoding with libwebp.
 *
 * Decisions owned here (docs/architecture.md, "Media: the plugin's rules", Thumbnails):
 *   - only trusted decoders run: every libvips loader is blocked, then JPEG, PNG, GIF and
 *     WebP are allowed again (and libvips' own "untrusted" set stays blocked), so a file
 *     claiming to be an image can never reach PDF, SVG, ImageMagick or similar parsers;
 *   - the pixel count is read from the header and anything over max_image_pixels is
 *     refused before a single pixel is decoded; the count is the larger of the frame and
 *     the container's declared canvas (canvas.c), which is what browsers allocate;
 *   - a JPEG is decoded by libjpeg's DCT scaling at the largest of 1/2, 1/4, 1/8 that
 *     leaves it no smaller than the thumbnail (jpeg_shrink_on_load), then reduced by
 *     vips_thumbnail_image. vips_thumbnail on the file would keep a further factor of two
 *     above the target (decoding four times the pixels: 1000x750 rather than 500x375 for
 *     a 12 MP photo to 320x240), which cost a third of a thumbnail's CPU time; the DCT
 *     scaling already low-passes, so the final reduce loses nothing visible at thumbnail
 *     size (docs/performance.md, "A gallery of thumbnails");
 *   - other formats go through vips_thumbnail, which decodes at reduced scale where the
 *     format allows (WebP scaling); both paths stream sequentially, honour EXIF
 *     orientation, take the first frame of an animation (every frame, as an animated
 *     WebP, when asked for one and the frames stay within bounds), never upscale, and fail
 *     on truncated input rather than inventing grey pixels;
 *   - WebP is encoded at effort (libwebp "method") RENDER_WEBP_EFFORT, not the default 4:
 *     a thumbnail is small and rendered once, and the default spent a sixth of its CPU
 *     time for files a few percent smaller;
 *   - libvips keeps no cache of images or descriptors and uses one worker per render, so
 *     memory and descriptors are bounded by the number of renders (the render pool's
 *     size, thumbnail.c).
 * What this file does not do: decide which size to render, write files, or coordinate
 * who renders (thumbnail.c).
 */
#include <string.h>

#include <vips/vips.h>
#include <vips/vector.h> /* vips_vector_set_enabled: not in vips.h in 8.14 */
#include <webp/encode.h>
#include <webp/mux.h>

#include "media.h"

#define RENDER_WEBP_QUALITY 80
#define RENDER_WEBP_EFFORT 2 /* libwebp's method: 0 (fastest) .. 6; its default is 4 */
#define RENDER_JPEG_MAX_SHRINK 8 /* libjpeg's DCT scaling: 1/2, 1/4 or 1/8 */
#define RENDER_MAX_BANDS_WITH_ALPHA 4
#define RENDER_DEFAULT_DELAY_MS 100 /* a frame without a delay */
/* Frames x thumbnail pixels of an animated thumbnail, at most (about 64 MiB as RGBA);
 * longer animations get their first frame. */
#define RENDER_MAX_ANIMATED_PIXELS (16LL * 1000 * 1000)

static const char *const TRUSTED_LOADERS[] = {"VipsForeignLoadJpeg", "VipsForeignLoadPng",
                                              "VipsForeignLoadNsgif", "VipsForeignLoadWebp", NULL};

int render_global_init(media *m)
{
    if (VIPS_INIT("atrium-media") != 0) {
        m->h->log(m->self, ATRIUM_LOG_ERROR, "libvips failed to start: %s", vips_error_buffer());
        vips_error_clear();
        return ATRIUM_E_STATE;
    }
    vips_cache_set_max(0);
    vips_cache_set_max_mem(0);
    vips_cache_set_max_files(0);
    vips_concurrency_set(1);
    /* No run-time code generation (liborc): concurrent renders crashed inside liborc's
     * JIT code allocator (orc_code_allocate_codemem) in a gallery test, and a crash of the
     * whole server costs more than the SIMD speed-up of resizing. */
    vips_vector_set_enabled(FALSE);
    vips_block_untrusted_set(TRUE);
    vips_operation_block_set("VipsForeignLoad", TRUE);
    for (size_t i = 0; TRUSTED_LOADERS[i]; i++) vips_operation_block_set(TRUSTED_LOADERS[i], FALSE);
    return 0;
}

void render_global_fini(void)
{
    vips_shutdown();
}

const char *render_strerror(int rc)
{
    switch (rc) {
    case RENDER_OK: return "ok";
    case RENDER_E_NOT_IMAGE: return "not an image this server decodes";
    case RENDER_E_TOO_LARGE: return "image too large to thumbnail";
    case RENDER_E_DECODE: return "image truncated or corrupt";
    case RENDER_E_NOMEM: return "out of memory";
    case RENDER_E_IO: return "file error";
    default: return "unknown error";
    }
}

/* Open the header only (no pixels are decoded until asked for). */
static VipsImage *open_header(const char *path)
{
    VipsImage *im = vips_image_new_from_file(path, "access", VIPS_ACCESS_SEQUENTIAL, NULL);
    if (!im) vips_error_clear();
    return im;
}

int render_probe(const char *path, int *width, int *height, int *frames)
{
    VipsImage *im = open_header(path);
    if (!im) return RENDER_E_NOT_IMAGE;
    int w = vips_image_get_width(im);
    int h = vips_image_get_page_height(im);
    if (vips_image_get_orientation_swap(im)) {
        int t = w;
        w = h;
        h = t;
    }
    *frames = vips_image_get_n_pages(im);
    g_object_unref(im);
    /* What a browser decodes: the declared canvas when it is larger than the frame. */
    uint32_t cw, ch;
    if (canvas_of_file(path, &cw, &ch) == 0 && (uint64_t)cw * ch > (uint64_t)w * h &&
        cw <= INT32_MAX && ch <= INT32_MAX) {
        w = (int)cw;
        h = (int)ch;
    }
    *width = w;
    *height = h;
    return RENDER_OK;
}

/* sRGB, 8 bits, 3 bands or 4 with alpha: what the WebP encoder takes. */
static VipsImage *to_srgb8(VipsImage *in)
{
    VipsImage *srgb = NULL, *cut = NULL, *out = NULL;
    if (vips_colourspace(in, &srgb, VIPS_INTERPRETATION_sRGB, NULL) != 0) return NULL;
    int bands = vips_image_get_bands(srgb);
    if (bands < 3) { /* sRGB always has 3 or 4: anything else is not an image we handle */
        g_object_unref(srgb);
        return NULL;
    }
    if (bands > RENDER_MAX_BANDS_WITH_ALPHA) {
        int keep = vips_image_hasalpha(srgb) ? 4 : 3;
        if (vips_extract_band(srgb, &cut, 0, "n", keep, NULL) != 0) {
            g_object_unref(srgb);
            return NULL;
        }
        g_object_unref(srgb);
        srgb = cut;
    }
    if (vips_cast_uchar(srgb, &out, NULL) != 0) out = NULL;
    g_object_unref(srgb);
    return out;
}

/* The encoder settings every thumbnail uses: quality and effort above. */
static bool webp_config(WebPConfig *config)
{
    if (!WebPConfigInit(config)) return false;
    config->quality = RENDER_WEBP_QUALITY;
    config->method = RENDER_WEBP_EFFORT;
    return WebPValidateConfig(config) != 0;
}

/* One frame (or the whole still) as WebP; *out is freed with WebPFree (render_free). */
static int encode_still(const uint8_t *px, int w, int h, int bands, uint8_t **out, size_t *len)
{
    WebPConfig config;
    WebPPicture pic;
    if (!webp_config(&config) || !WebPPictureInit(&pic)) return RENDER_E_NOMEM;
    pic.use_argb = 0; /* YUV straight from RGB, as WebPEncodeRGB does */
    pic.width = w;
    pic.height = h;
    WebPMemoryWriter writer;
    WebPMemoryWriterInit(&writer);
    pic.writer = WebPMemoryWrite;
    pic.custom_ptr = &writer;
    int ok = bands == 4 ? WebPPictureImportRGBA(&pic, px, w * 4)
                        : WebPPictureImportRGB(&pic, px, w * 3);
    if (ok) ok = WebPEncode(&config, &pic);
    WebPPictureFree(&pic);
    if (!ok || writer.size == 0) {
        WebPMemoryWriterClear(&writer);
        return RENDER_E_NOMEM;
    }
    *out = writer.mem;
    *len = writer.size;
    return RENDER_OK;
}

/* An animation as libvips lays it out: frames stacked vertically, and the part of each
 * frame to keep (all of it, or the centre for a crop). */
typedef struct strip {
    const uint8_t *px;
    int width, page_h, frames, bands;
    int crop_x, crop_y, crop_w, crop_h;
} strip;

/* The frames as an animated WebP; delays in ms per frame (missing or 0:
 * RENDER_DEFAULT_DELAY_MS), loop 0 = forever. */
static int encode_animation(const strip *st, const int *delays, int n_delays, int loop,
                            uint8_t **out, size_t *len)
{
    WebPAnimEncoderOptions opts;
    WebPConfig config;
    if (!WebPAnimEncoderOptionsInit(&opts) || !webp_config(&config)) return RENDER_E_NOMEM;
    opts.anim_params.loop_count = loop;
    WebPAnimEncoder *enc = WebPAnimEncoderNew(st->crop_w, st->crop_h, &opts);
    if (!enc) return RENDER_E_NOMEM;
    int rc = RENDER_OK, timestamp = 0;
    size_t stride = (size_t)st->width * st->bands;
    for (int i = 0; i < st->frames && rc == RENDER_OK; i++) {
        WebPPicture pic;
        if (!WebPPictureInit(&pic)) {
            rc = RENDER_E_NOMEM;
            break;
        }
        pic.use_argb = 1;
        pic.width = st->crop_w;
        pic.height = st->crop_h;
        const uint8_t *f = st->px + stride * ((size_t)i * st->page_h + st->crop_y) +
                           (size_t)st->crop_x * st->bands;
        int ok = st->bands == 4 ? WebPPictureImportRGBA(&pic, f, (int)stride)
                                : WebPPictureImportRGB(&pic, f, (int)stride);
        if (!ok || !WebPAnimEncoderAdd(enc, &pic, timestamp, &config)) rc = RENDER_E_NOMEM;
        WebPPictureFree(&pic);
        timestamp += i < n_delays && delays[i] > 0 ? delays[i] : RENDER_DEFAULT_DELAY_MS;
    }
    WebPData data;
    WebPDataInit(&data);
    if (rc == RENDER_OK &&
        (!WebPAnimEncoderAdd(enc, NULL, timestamp, NULL) || !WebPAnimEncoderAssemble(enc, &data)))
        rc = RENDER_E_NOMEM;
    WebPAnimEncoderDelete(enc);
    if (rc != RENDER_OK) {
        WebPDataClear(&data);
        return rc;
    }
    *out = (uint8_t *)data.bytes;
    *len = data.size;
    return RENDER_OK;
}

/* The size an animation's frames are reduced to: the box itself (scale), or the smallest
 * size covering the box (crop: the centre is cut from each frame later); never larger than
 * the frame. */
static void animation_target(const media_size *s, int frame_w, int frame_h, int *w, int *h)
{
    *w = s->width;
    *h = s->height;
    if (!s->crop) return;
    double scale = (double)s->width / frame_w;
    if ((double)s->height / frame_h > scale) scale = (double)s->height / frame_h;
    if (scale > 1.0) scale = 1.0;
    *w = (int)(frame_w * scale + 0.999);
    *h = (int)(frame_h * scale + 0.999);
}

/* The DCT scaling a JPEG of w x h is decoded at for a tw x th thumbnail (crop: covering
 * the box; scale: fitting it): the largest of 8, 4, 2 that still leaves the decoded image
 * at least the thumbnail's size, else 1. w and h as the image is shown (after EXIF
 * orientation): what vips_thumbnail_image measures the box against. */
static int jpeg_shrink_on_load(int w, int h, int tw, int th, bool crop)
{
    double sx = (double)w / tw, sy = (double)h / th;
    double shrink = crop ? (sx < sy ? sx : sy) : (sx > sy ? sx : sy);
    for (int k = RENDER_JPEG_MAX_SHRINK; k > 1; k /= 2)
        if (shrink >= k) return k;
    return 1;
}

/* vips_thumbnail for a still JPEG of w x h as shown, with the shrink-on-load chosen
 * above. 0, or -1 with the libvips error buffer set. */
static int thumbnail_jpeg(const char *path, int w, int h, int tw, int th, bool crop,
                          VipsImage **thumb)
{
    int shrink = jpeg_shrink_on_load(w, h, tw, th, crop);
    VipsImage *in = vips_image_new_from_file(path, "shrink", shrink, "access",
                                             VIPS_ACCESS_SEQUENTIAL, "fail_on",
                                             VIPS_FAIL_ON_TRUNCATED, NULL);
    if (!in) return -1;
    int rc = vips_thumbnail_image(in, thumb, tw, "height", th, "size", VIPS_SIZE_DOWN, "crop",
                                  crop ? VIPS_INTERESTING_CENTRE : VIPS_INTERESTING_NONE, NULL);
    g_object_unref(in);
    return rc;
}

static bool is_jpeg(VipsImage *head)
{
    const char *loader = NULL;
    return vips_image_get_typeof(head, VIPS_META_LOADER) &&
           vips_image_get_string(head, VIPS_META_LOADER, &loader) == 0 && loader &&
           strcmp(loader, "jpegload") == 0;
}

int render_thumbnail(const char *path, const media_size *s, int64_t max_pixels, uint8_t **out,
                     size_t *len)
{
    *out = NULL;
    *len = 0;
    VipsImage *head = open_header(path);
    if (!head) return RENDER_E_NOT_IMAGE;
    int frame_w = vips_image_get_width(head), frame_h = vips_image_get_page_height(head);
    int pages = vips_image_get_n_pages(head);
    bool jpeg = is_jpeg(head), swap = vips_image_get_orientation_swap(head);
    g_object_unref(head);
    int64_t frame_pixels = (int64_t)frame_w * frame_h;
    uint32_t cw, ch; /* the declared canvas counts too (canvas.c) */
    if (frame_pixels > max_pixels ||
        (canvas_of_file(path, &cw, &ch) == 0 && (int64_t)cw * ch > max_pixels))
        return RENDER_E_TOO_LARGE;
    /* Every frame is decoded for an animation: they count together. */
    bool animated = s->animated && pages > 1 && frame_pixels * pages <= max_pixels &&
                    (int64_t)s->width * s->height * pages <= RENDER_MAX_ANIMATED_PIXELS;

    /* Load options travel in the file name: "[n=-1]" loads every frame. libvips crops a
     * whole strip, not each frame, so an animation is reduced here and cut below. */
    char name[MEDIA_PATH_MAX + 8];
    snprintf(name, sizeof(name), "%s%s", path, animated ? "[n=-1]" : "");
    int tw = s->width, th = s->height;
    if (animated) animation_target(s, frame_w, frame_h, &tw, &th);
    VipsImage *thumb = NULL;
    int vrc = !animated && jpeg
                  ? thumbnail_jpeg(path, swap ? frame_h : frame_w, swap ? frame_w : frame_h, tw,
                                   th, s->crop, &thumb)
                  : vips_thumbnail(name, &thumb, tw, "height", th, "size", VIPS_SIZE_DOWN, "crop",
                                   s->crop && !animated ? VIPS_INTERESTING_CENTRE
                                                        : VIPS_INTERESTING_NONE,
                                   "fail_on", VIPS_FAIL_ON_TRUNCATED, NULL);
    if (vrc != 0) {
        vips_error_clear();
        return RENDER_E_DECODE;
    }
    int *delays = NULL, n_delays = 0, loop = 0;
    int page_h = vips_image_get_page_height(thumb);
    if (animated) {
        if (vips_image_get_typeof(thumb, "delay"))
            vips_image_get_array_int(thumb, "delay", &delays, &n_delays);
        if (vips_image_get_typeof(thumb, "loop")) vips_image_get_int(thumb, "loop", &loop);
    }
    VipsImage *rgb = to_srgb8(thumb);
    if (!rgb) {
        g_object_unref(thumb);
        vips_error_clear();
        return RENDER_E_DECODE;
    }
    size_t bytes = 0;
    /* The decode happens here, through the pipeline, at the reduced size. */
    uint8_t *px = vips_image_write_to_memory(rgb, &bytes);
    strip st = {.px = px,
                .width = vips_image_get_width(rgb),
                .page_h = page_h,
                .bands = vips_image_get_bands(rgb)};
    int height = vips_image_get_height(rgb);
    g_object_unref(rgb);
    int rc;
    if (!px) {
        vips_error_clear();
        rc = RENDER_E_DECODE;
    } else if (animated && page_h > 0 && height % page_h == 0 && height / page_h > 1) {
        st.frames = height / page_h;
        st.crop_w = s->crop && s->width < st.width ? s->width : st.width;
        st.crop_h = s->crop && s->height < page_h ? s->height : page_h;
        st.crop_x = (st.width - st.crop_w) / 2;
        st.crop_y = (page_h - st.crop_h) / 2;
        rc = encode_animation(&st, delays, n_delays, loop, out, len);
    } else {
        rc = encode_still(px, st.width, height, st.bands, out, len);
    }
    g_free(px);
    g_object_unref(thumb); /* owns delays */
    return rc;
}

void render_free(uint8_t *buf)
{
    WebPFree(buf);
}
